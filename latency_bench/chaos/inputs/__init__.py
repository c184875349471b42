"""What a buggy or hostile client sends: generators of malformed messages, mutated offers, bad audio, injections."""
