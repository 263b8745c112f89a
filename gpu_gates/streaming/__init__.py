"""The single controller in real time: the pumps on asyncio, the split-API trainer and the
parity gate's reference step."""
