"""The mapping in the words of the frameworks that run it, both ways.

    costmodel.frameworks.definitions  the frameworks' own flag and field definitions, cited
    costmodel.frameworks.common       what every exporter and importer shares
    costmodel.frameworks.megatron     Megatron-LM command-line arguments
    costmodel.frameworks.bridge       Megatron-Bridge recipe overrides
    costmodel.frameworks.torchtitan   torchtitan job TOML
    costmodel.frameworks.launch       a launch file of any of the three read as a mapping
    costmodel.frameworks.logs         Megatron-LM and torchtitan training logs read as runs

docs/frameworks-megatron-lm.md, docs/frameworks-megatron-bridge.md and
docs/frameworks-torchtitan.md give the field tables.
"""
