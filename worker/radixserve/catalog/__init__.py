"""What this worker serves and the names it answers to, torch-free: the architectures, the
servable check, the quantization methods, the attention backends' names, checkpoint files and
the Hub cache, and the constraint kinds. The front end, the CLI and the loaders all read
these; none of them needs torch to."""
