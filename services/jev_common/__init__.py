"""Code shared by every jev service: API schema, env config, errors, metrics, logging."""
