"""What a strategy decides at one position: SAFE's rules, the cross-vocabulary ensemble, sampling,
the drafter's spelling of the ensemble's choice."""
