"""tinytarget's CPU reference (numpy), independent of any backend."""
import numpy as np


def scale(x: np.ndarray, s: float) -> np.ndarray:
    return (x * np.float32(s)).astype(np.float32)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a + b).astype(np.float32)
