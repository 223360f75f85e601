"""OmniJev-4B v1.1 (family `omnijev`): its decision and ordinal heads (heads.py) over option rows on the
causal-lm-rows backend; readout.py."""
