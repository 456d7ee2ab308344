"""The weights a run saved, in your own code: build your module, load them, predict.

python examples/train_your_model.py     # trains TinyNet, writes runs/your_model
python examples/use_your_weights.py     # the same test split through the saved weights
"""

import torch
from sklearn.datasets import load_digits
from train_your_model import TinyNet  # the class the run trained (no other program can import a script's __main__)

import accel_train

model = TinyNet(num_classes=10, in_channels=1, image_size=8).eval()
meta = accel_train.load_weights(model, "runs/your_model/model")  # or a checkpoint folder, or a converted export
mean, std = (torch.tensor(meta["model_config"][k]).view(1, -1, 1, 1) for k in ("mean", "std"))
digits = load_digits()
images = torch.tensor(digits.images[1400:, None] * 255 / 16, dtype=torch.float32).round() / 255  # as uint8 in the run
with torch.no_grad():
    predicted = model((images - mean) / std).argmax(dim=1)  # normalised as the loop normalised
correct = int((predicted == torch.tensor(digits.target[1400:])).sum())
print(f"accuracy {correct / len(predicted):.4f} ({correct}/{len(predicted)})")
