"""Configuration: config.pbtxt and backend options in, one typed `ModelSpec` out."""
