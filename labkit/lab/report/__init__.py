"""`labkit report`: the tables of README.md and docs/ generated from the stored runs in data/."""
