"""The robustness suite: traffic, a seeded nemesis, and a checker that trusts only logs.

Modelled on the etcd robustness tests and Jepsen: worker processes (:mod:`.traffic`) take
every kind of lock on a few names and write through their fencing tokens to a SQLite
store (:mod:`.store`); a nemesis (:mod:`.nemesis`) injects faults on a seeded schedule
and logs each window; the checker (:mod:`.checker`) reads only the workers' logs, the
nemesis's log and the store. :mod:`.scenarios` defines the scenarios and the two
profiles; ``python -m tests.robustness --profile short|long`` runs them
(docs/reliability.md, "Robustness suite").
"""
