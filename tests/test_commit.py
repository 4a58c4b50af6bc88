"""A commit says where the response ends (an end token, a stop sequence) in what it returns; the run reads it."""

from types import SimpleNamespace

from tiny_models import unigram_tokenizer

from safe_engine.contract.reasons import Decision, StopReason
from safe_engine.run.committing import Committer
from safe_engine.run.forcing import Forcing
from safe_engine.run.piece import Piece
from safe_engine.run.response import Response
from safe_engine.run.stop_sequences import StopSequences
from safe_engine.tokenization.alignment import TokenBytes

TOKENIZER = unigram_tokenizer(["ab", "cd", "ef"])
VOCAB = TokenBytes(TOKENIZER)
EOS = TOKENIZER.eos_token_id
IDS = {text: VOCAB.encode_bytes(text.encode()) for text in ("ab", "cd", "ef")}
PIECES = [Piece(IDS[text], Decision.ACCEPTED) for text in ("ab", "cd", "ef")]


def committer(stop=(), force=()) -> Committer:
    response = Response(SimpleNamespace(vocab=VOCAB))
    return Committer(response, Forcing(force, VOCAB, "drafter"), StopSequences(stop), {EOS})


def test_a_commit_returns_the_end_it_reached_and_appends_nothing_after_it():
    goes_on = committer().append(0, PIECES)
    assert goes_on.end is None and goes_on.spans == [(0, 2), (2, 4), (4, 6)]
    stopped = committer(stop=("bc",)).append(0, PIECES)
    assert stopped.end == StopReason.STOP_SEQUENCE and stopped.pieces == PIECES[:2]
    ended = committer().append(0, [PIECES[0], Piece([EOS], Decision.ACCEPTED)])
    assert ended.end == StopReason.EOS and ended.spans == [(0, 2), (2, 2)]


def test_a_forced_text_replaces_the_piece_at_its_index_and_is_the_last_appended():
    forcing = committer(force=((1, "ef"),))
    assert not forcing.diverted(0, PIECES[:1]) and forcing.diverted(0, PIECES[:2])
    forced = forcing.append(0, PIECES)
    assert [p.ids for p in forced.pieces] == [IDS["ab"], IDS["ef"]] and forced.end is None
    assert forced.pieces[1].decision == Decision.FORCED and forced.pieces[1].drafted == "cd"
    assert forcing.append(2, PIECES[:1]).pieces == PIECES[:1]  # past the forced index: the strategy's piece
