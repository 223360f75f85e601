"""`jev`: a small command line for trying the stack by hand (`python -m jev ask ...`)."""
