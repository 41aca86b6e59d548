"""The model side: network, loss, optimiser arithmetic, FLOP count, synthetic batches and the LightningModule.

=================  ==================================================================
module             content
=================  ==================================================================
``network``        :class:`~cropscale.model.network.CropMappingNet` (plain ``nn.Module``)
``losses``         :class:`~cropscale.model.losses.MultiTaskLoss`, the weighted multi-task loss
``optim``          optimisers, batch-size arithmetic, LR scaling rules, warm-up; their set-up from the Trainer
``speed``          speed levers: ``torch.compile`` of the network, fused AdamW choice
``flops``          FLOPs per training sample (``FlopCounterMode``)
``synthetic``      synthetic batches that follow the batch contract (:mod:`cropscale.batch`)
``settings``       the task's settings checked; a checkpoint's architecture compared
``evaluation``     evaluation placeholders dropped, ``val/loss`` from element-weighted terms, IoU keys
``task``           the LightningModule that trains the network (LightningCLI ``model:``)
=================  ==================================================================
"""
