"""The model side: network, loss, optimiser arithmetic, FLOP count, synthetic batches and the LightningModule.

=================  ==================================================================
module             content
=================  ==================================================================
``network``        :class:`~cropscale.model.network.CropMappingNet` (plain ``nn.Module``)
``losses``         :class:`~cropscale.model.losses.MultiTaskLoss`, the weighted multi-task loss
``optim``          batch-size arithmetic, learning-rate scaling rules, warm-up schedule
``flops``          FLOPs per training sample (``FlopCounterMode``)
``synthetic``      synthetic batches that follow the batch contract (:mod:`cropscale.batch`)
``task``           the LightningModule that trains the network (LightningCLI ``model:``)
=================  ==================================================================
"""
