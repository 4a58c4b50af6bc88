// Reads the npm reference tokenizers for scripts/convert_js_tokenizers.py and its exactness tests.
//
//   node tokenizer_data.mjs dump FAMILY                 -> {"vocab": [...], "merges": [[a, b], ...],
//                                                            "added": [...], "split_regex": str|null}
//   node tokenizer_data.mjs encode FAMILY MODE < texts  -> [[ids], ...] for a JSON list of texts
//
// MODE "text" encodes special-token strings as plain text; "specials" lets the encoder turn them into
// their ids (only Llama 3's encoder can). Neither adds BOS/EOS. Everything comes from the packages'
// own objects and encoders: nothing here re-implements a tokenizer.
import fs from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const NEVER = /(?!)/g;  // a special-token pattern that matches nothing

// Llama 1/2 and Mistral: no BOS, with SentencePiece's dummy prefix (their encoders know no special tokens).
const sentencePieceEncode = (tok, text) => tok.encode(text, false, true);

const FAMILIES = {
    'llama-3': {
        load: () => import('llama3-tokenizer-js'),
        // The package appends its special tokens to the 128,000 BPE pieces; an instance built with
        // none tells how many pieces come first.
        added: (mod) => mod.default.vocabById.slice(new mod.Llama3Tokenizer(undefined, undefined, []).vocabById.length),
        // The pre-tokenizer pattern exactly as the package ships it (its Python/Rust form).
        splitRegex: () => {
            const source = fs.readFileSync(require.resolve('llama3-tokenizer-js'), 'utf8');
            return JSON.parse(source.match(/DIRTY_LLAMA3_REGEX_STRING = ("(?:[^"\\]|\\.)*")/)[1]);
        },
        encode: (tok, text, mode) =>
            tok.encode(text, mode === 'text' ? { bos: false, eos: false, specialTokenRegex: NEVER } : { bos: false, eos: false }),
    },
    'mistral-7b': { load: () => import('mistral-tokenizer-js'), encode: sentencePieceEncode },
    'llama-2': { load: () => import('llama-tokenizer-js'), encode: sentencePieceEncode },
};

function mergePairs(merges) {
    // The packages key merges as "left right" with their priority as the value; no piece holds a space.
    return [...merges.entries()].sort((a, b) => a[1] - b[1]).map(([key]) => {
        const cut = key.indexOf(' ');
        return [key.slice(0, cut), key.slice(cut + 1)];
    });
}

async function main() {
    const [command, name, mode = 'text'] = process.argv.slice(2);
    const family = FAMILIES[name];
    if (!family || !['dump', 'encode'].includes(command)) {
        console.error(`usage: node tokenizer_data.mjs dump|encode ${Object.keys(FAMILIES).join('|')} [text|specials]`);
        process.exit(2);
    }
    const mod = await family.load();
    const tok = mod.default;
    if (command === 'dump') {
        const added = family.added?.(mod) ?? [];
        const vocab = tok.vocabById.slice(0, tok.vocabById.length - added.length);
        const splitRegex = family.splitRegex?.() ?? null;
        process.stdout.write(JSON.stringify({ vocab, merges: mergePairs(tok.merges), added, split_regex: splitRegex }));
        return;
    }
    const texts = JSON.parse(fs.readFileSync(0, 'utf8'));
    process.stdout.write(JSON.stringify(texts.map((text) => family.encode(tok, text, mode))));
}

main();
