"""bmt's Python tools, one module each, installed as console scripts by
`pip install .` (pyproject.toml at the repository's root):

    bmt-export-hf     bmt.export_hf     Hugging Face model -> .pt / .pt2 for bmt-opt
    bmt-prepare-data  bmt.prepare_data  text -> token files for bmt-run --data
    bmt-plot          bmt.plot          bmt-run metrics log -> PNG

Each also runs as `python3 -m bmt.<module>` with the same arguments. The
compiler and the runtime (bmt-opt, bmt-run) are C++ binaries built by CMake,
not part of this package.
"""
