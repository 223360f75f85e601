"""jev frontend: the public HTTP edge. Validates /v1/systemone requests and proxies them to one worker."""
