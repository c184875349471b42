"""Long recordings to text: silence removed, speech cut into <= 30 s segments at pauses,
segments transcribed in parallel worker processes, stitched back by timestamp, and (with
diarization) each segment labelled with who spoke. Imports models/ only."""
