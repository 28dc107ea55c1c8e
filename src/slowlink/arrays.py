"""The one array type the layers pass between them: named float32 tensors of a fragment, as numpy arrays.

Shared vocabulary, like errors.py: every layer may import it.
"""

import numpy as np

Arrays = dict[str, np.ndarray]
