"""The model plane: each model (asr, llm, tts, codec, embedder) as its own worker.

A deployment file (configs/deployments/*.yaml) says which workers exist, which engine runs
each, and on which device: `cpu`, `cuda:N`, or one MIG slice of an H100/H200. `gpus` reads
what this machine has, `placement` turns the two into a plan (or refuses it, listing every
problem), `launch` builds each worker's command line and environment, and `supervisor`
starts them.

Layering: `workers/` may import `models/` (engines, errors) and nothing above it: never
`agent/` or `pipelines/`. A worker process on its own slice imports `models/` and
`workers/` alone, without the web server or the pipeline.
"""
