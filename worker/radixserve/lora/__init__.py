"""Many LoRA adapters on one base model: reading PEFT adapters (`adapter`), the device's slots
of adapter weights that the model's projections read (`pool`), and the adapters a server
serves, their host copies and which slot each holds (`manager`)."""
