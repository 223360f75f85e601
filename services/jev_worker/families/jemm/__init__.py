"""JEMM (family `jemm`): JEMM's own System One contract on the causal-lm backend; readout.py."""
