package command

import (
	"github.com/spf13/cobra"
)

func (a *app) completionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print the shell completion script",
		Long: `Print a completion script for bash, zsh or fish. Load it in the current shell, or
install it where your shell reads completions.`,
		Example: `  source <(gantry completion bash)
  gantry completion zsh > "${fpath[1]}/_gantry"
  gantry completion fish > ~/.config/fish/completions/gantry.fish`,
		Args:                  cobra.ExactArgs(1),
		ValidArgs:             []string{"bash", "zsh", "fish"},
		DisableFlagsInUseLine: true,
		PersistentPreRunE:     func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, args []string) error {
			root := cmd.Root()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(a.out, true)
			case "zsh":
				return root.GenZshCompletion(a.out)
			case "fish":
				return root.GenFishCompletion(a.out, true)
			}
			return usageErr(cobra.OnlyValidArgs(cmd, args))
		},
	}
}
