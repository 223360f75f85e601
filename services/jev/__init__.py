"""`jev`: a small command line: one decision by hand (`jev ask ...`), a whole dataset (`jev batch ...`)."""
