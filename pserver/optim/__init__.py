"""Layer 1, pure: update rules (SGD, momentum, Nesterov, AdaGrad; block momentum; a learner's local
rule; PP-ASGD's prediction) and BLAS thread limits."""
