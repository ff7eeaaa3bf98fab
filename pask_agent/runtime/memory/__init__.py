"""KV memory: the mixed-precision store, its preallocated pools and slots, admission by plan,
history planning and host-memory settings. Imports policy/, kernels/ and errors only — never
the engine, models/ or turns/, so the store can be tested without a model."""
