"""The pure core: records, arithmetic and options, with no I/O (acceptance, sampling, alignment, usage, load)."""
