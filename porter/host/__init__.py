"""The machine porter runs on: the sandbox and its cgroup bounds, the CUDA toolchain, the GPU's
architecture, and locks shared by threads and processes."""
