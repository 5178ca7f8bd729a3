"""The tests live in folders by the source area they check (import/, passes/,
runtime/, models/, tools/, bench/); the helpers (bmt_paths.py, numerics.py, stalled.py)
stay here. Test modules import helpers and each other by module name, so this
folder and every area folder go on sys.path before any test module loads."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _folder in [_HERE] + sorted(os.path.join(_HERE, d) for d in os.listdir(_HERE)):
    if os.path.isdir(_folder) and not os.path.basename(_folder).startswith(("_", ".")) \
            and _folder not in sys.path:
        sys.path.insert(0, _folder)
