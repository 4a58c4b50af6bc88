"""The decoding strategies behind ``decode``: single, per-token (UniTE) and SAFE, with SAFE's overlap."""
