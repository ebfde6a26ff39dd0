"""Configuration: the typed settings of a run (schema), where they come from (shipped YAML files, a user's file,
`--set key=value`), how a value is parsed and named in messages, the rules that tie settings to model.arch, and the
key reference generated from the schema.

The lowest package above the base modules (charlm.errors, charlm.files): imports nothing else of charlm and no torch.
"""
