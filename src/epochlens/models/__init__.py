"""Built-in model architectures and class-incremental logit restriction."""
