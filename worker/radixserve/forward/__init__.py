"""The types a batch crosses layers in: `ForwardMode`, `ModelWorkerBatch` (scheduler -> model
worker) and `ForwardBatch` (model runner -> models, layers and attention backends).

They sit below every layer that hands them over or reads them and import nothing above them,
so no layer has to import the one that produces its input.
"""
