"""Optional drop-ins for frameworks that size themselves from host memory.

Nothing here is imported by `import cgwatch`, and nothing here imports a framework at import
time: `cgwatch.integrations.deepspeed` imports DeepSpeed (and so torch) only when asked to
install its accelerator. Command line: `python -m cgwatch.integrations --help`.
"""
