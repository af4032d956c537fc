"""The parts of lowbit.safetensors_io (import from there): common (dtypes, limits, the error),
files (paths, atomic output), header (parsing and validation), reader, writer."""
