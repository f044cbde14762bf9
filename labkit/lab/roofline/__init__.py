"""The sync roofline: what a sync carries (from config.json alone) and the bound each transport sets."""
