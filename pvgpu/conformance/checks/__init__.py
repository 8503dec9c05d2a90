"""The conformance checks, one module per part of spec/pvgpu.md (registry.GROUPS lists
them): each function decorated with @check is one check of the clauses it names."""
