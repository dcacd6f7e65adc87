"""Speculative decoding: propose several tokens per request, check them in one target pass.

Batch-1 decode is bound by reading the weights once per token; scoring k proposed tokens in the
same read makes one user's tokens come faster. The pieces, each with one owner:

- `proposer.py`: what a proposer is (`Proposer`), the one interface every method implements;
- `ngram.py`: prompt lookup over the request's own prompt and output (host, numpy);
- `verify.py`: the verify step's acceptance on the device (the target's own sampler at every
  position; greedy = longest matching prefix plus the target's next token);
- `speculator.py`: the scheduler's side: which rows speculate and how far (adaptive), the
  proposals' budget against free KV, the bookkeeping after a verify (stops midway, the
  rejected tokens' KV released) and the counters behind the metrics.
"""
