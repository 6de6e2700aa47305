"""Partition state of the operators (design sections 6-8).

Keyed user state with its ordered expiry index (`keyed_state`), timers ordered by
firing time (`timers`), and the adapter serving Beam's state protocol from them
(`state_handler`). Installed as `beam_streams_runner.state`.
"""
