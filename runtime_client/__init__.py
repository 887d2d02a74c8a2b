"""PyTorch runtime client of Layerwise Repacking (see docs/runtime.md).

Nothing is imported here on purpose: ``runtime_client.plan_client`` must stay importable
without torch (data-loader workers), while every other module needs torch.distributed.
"""
