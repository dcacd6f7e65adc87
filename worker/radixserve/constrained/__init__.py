"""Constrained decoding: a request's output follows a JSON Schema, a regular expression or an
EBNF grammar.

`validation` is the front end's cheap, torch-free check; `base_grammar_backend` the interface the
scheduler and the sampler program against; `xgrammar_backend` the implementation; `grammar_cache`
compiles grammars once per (kind, text) beside the scheduler's loop, within a time limit, a bound
on compiles at once and a byte budget, in `compile_worker`'s processes (a compile stopped there
is killed).
"""
