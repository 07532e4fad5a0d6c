"""phaze: co-design a training accelerator and how LLMs are trained on it."""
