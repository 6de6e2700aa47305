"""How each Beam primitive the runner executes itself becomes Spark work.

One module per primitive (design section 3): `impulse`, `par_do` (every
SDK-side primitive fused into a stage; `stateless_chain` and `chain_steps` run a
run of its stateless steps as one operation), `group_by_key` (also the keyed shuffle
of stateful ParDos and lifted Combines; `kv_chunks` reads its windowed KVs),
`flatten`, `reshuffle` and `side_inputs`. Installed as `beam_streams_runner.translators`.
"""
