"""The frame-stack study and the replay-DDDQN study (pre-registered): do saliency maps flag a broken
frame stack, or a broken replay buffer, before the return curve does? README.md describes both."""
