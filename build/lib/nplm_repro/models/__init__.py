"""Eq. (1) and how it is trained: the network, its losses, the precision it computes in, the LightningModule."""
