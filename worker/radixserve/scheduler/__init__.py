"""The scheduler process: the policy (admission, chunking, retraction), its process shell and
sockets, the batches, the model worker it drives, and its counters. It owns the GPU; the front
end reaches it only through the messages in `radixserve.boundary`."""
