"""pplx-decider (family `pplx-decider`): a code-readout v1 checkpoint served with Perplexity's own prompt
(readout.py), on the causal-lm or noncausal-lm backend as its decision_config.json says."""
