"""Fleets: a node's class as Node Feature Discovery labels, and one plan per class on Kubernetes.

- :mod:`edgectl.fleet.labels` — a probe's facts as NFD labels (the local source's feature file),
  and back: the facts of a node *class*, which is what a class's plan is computed from.
- :mod:`edgectl.fleet.k8s` — one plan (edgectl.plan/1) as the Kubernetes objects that run the
  worker the systemd unit runs: ConfigMap, Deployment, Service.
- :mod:`edgectl.fleet.fleet` — probes of several nodes grouped by class, one plan per class.

Plain data in, plain data out: nothing here talks to a cluster.
"""
