"""Paper A (Rosynski et al. 2020): its claims about the gradient and CAM methods, checked on our
Breakout agents, and its split-attention agent. README.md describes the study."""
