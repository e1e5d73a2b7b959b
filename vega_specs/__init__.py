"""Data only: the panel's generated Vega spec (`modprof.vg.json`, see README.md), installed as
`wandb_modprof.vega_specs` (pyproject.toml maps this folder there)."""
