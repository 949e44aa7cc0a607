"""PyTorch peers for the side-by-side benchmark: the Nature-CNN with weights copied from flax
params, and the saliency methods users would otherwise pick (Captum, pytorch-grad-cam, and
plain batched torch versions where those libraries have none). Needs the `bench` extra."""
