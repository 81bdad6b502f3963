"""The layer pipeline: config -> templates -> meta-rocky-vulkan/ and kas/ (render), then lint."""
