"""fa2tune's kernels behind other libraries' extension points (each module imports its library
only when imported itself)."""
