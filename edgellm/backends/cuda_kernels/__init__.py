"""The cuda backend's numba.cuda kernels (ops, attention, matmul over every weight type's blocks).

Importing the package first puts back one numpy alias numba-cuda needs: numba-cuda 0.30 registers an
overload on `np.row_stack` when it loads its lowering registries (at the first kernel compile), and numpy
2.5 removed that alias of `np.vstack` (deprecated since numpy 2.0), so every compile failed there with
"module 'numpy' has no attribute 'row_stack'" (seen on an H100 machine with numpy 2.5.2). The alias is the
function numpy itself had; `cuda.registries_refusal` still refuses any other clash by name."""

import numpy as np

if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
