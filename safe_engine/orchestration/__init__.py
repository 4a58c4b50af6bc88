"""Many runs at once (``decode_many``, ``decode_ahead``) and comparisons of strategies on one prompt."""
