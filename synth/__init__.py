"""synth: FedForge federated differentially private tabular synthesis (not yet built).

This package will hold parties' marginal measurement, compression, hierarchical
secure aggregation and the synthesis engine; see the project's issues.
"""
