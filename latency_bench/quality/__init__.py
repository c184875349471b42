"""Reply quality: grounded answers, refusals, length, the prompt sweep, mid-sentence pauses, WER and DER."""
