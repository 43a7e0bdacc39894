package command

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
	"github.com/gantry-gpu/gantry/cli/internal/tty"
	"github.com/gantry-gpu/gantry/proto/api"
)

// The terminal's WebSocket protocol (docs/terminal.md): the token travels only as a
// subprotocol; binary frames are terminal bytes, text frames JSON control messages.
const (
	terminalSubprotocol = "gantry.terminal.v1"
	tokenSubprotocol    = "gantry.token."
)

type terminalControl struct {
	Type   string          `json:"type"`
	Code   *int            `json:"code,omitempty"`
	Reason string          `json:"reason,omitempty"`
	Cols   int             `json:"cols,omitempty"`
	Rows   int             `json:"rows,omitempty"`
	Error  json.RawMessage `json:"error,omitempty"`
}

func (a *app) terminalCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "terminal ALLOC [-- COMMAND...]",
		Short: "Open a shell in a running allocation through the control plane",
		Long: `Open a terminal in the allocation (by id or name) over the control plane's terminal
WebSocket: no SSH key or open port needed. On a terminal the local side goes raw and
window size changes follow. With COMMAND, it is typed into the shell followed by exit.
The command exits with the shell's exit status.`,
		Example: `  gantry terminal train
  gantry terminal train -- nvidia-smi`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, project, id, err := a.allocArg(ctx, args[0])
			if err != nil {
				return err
			}
			inFile, _ := a.in.(*os.File)
			outFile, _ := a.out.(*os.File)
			interactive := len(args) == 1 && inFile != nil && tty.IsTerminal(int(inFile.Fd()))
			body := api.CreateTerminalSessionJSONRequestBody{}
			if outFile != nil {
				if c, r, err := tty.Size(int(outFile.Fd())); err == nil && c > 0 && r > 0 {
					body.Cols, body.Rows = &c, &r
				}
			}
			res, err := s.API.CreateTerminalSessionWithResponse(ctx, id, &api.CreateTerminalSessionParams{XProjectID: project}, body)
			if err != nil {
				return err
			}
			if err := ok(res.HTTPResponse, res.Body); err != nil {
				return err
			}
			sess := res.JSON201
			wsURL := strings.TrimRight(s.Profile.URL, "/") + sess.WebsocketPath
			wsURL = "ws" + strings.TrimPrefix(wsURL, "http")
			conn, hr, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{
				HTTPClient:   s.HTTP,
				Subprotocols: []string{terminalSubprotocol, tokenSubprotocol + sess.Token},
			})
			if err != nil {
				if hr != nil && hr.StatusCode != http.StatusSwitchingProtocols {
					b, _ := io.ReadAll(hr.Body)
					return apiclient.Check(hr.StatusCode, hr.Header, b)
				}
				return err
			}
			conn.SetReadLimit(4 << 20)
			var command string
			if len(args) > 1 {
				command = strings.Join(args[1:], " ")
			}
			return a.runTerminal(ctx, conn, inFile, outFile, interactive, command)
		},
	}
}

func (a *app) runTerminal(ctx context.Context, conn *websocket.Conn, inFile, outFile *os.File, interactive bool, command string) error {
	defer conn.CloseNow()
	if interactive {
		st, err := tty.MakeRaw(int(inFile.Fd()))
		if err != nil {
			return err
		}
		defer st.Restore()
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if c, r, err := tty.Size(int(outFile.Fd())); err == nil {
					b, _ := json.Marshal(terminalControl{Type: "resize", Cols: c, Rows: r})
					_ = conn.Write(ctx, websocket.MessageText, b)
				}
			}
		}()
	}
	if command == "" {
		// Keystrokes (or piped input) go out as they come.
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := a.in.Read(buf)
				if n > 0 {
					if conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return &exitError{code: ExitInterrupted, err: errors.New("interrupted")}
			}
			return fmt.Errorf("terminal connection ended: %w", err)
		}
		if typ == websocket.MessageBinary {
			if _, err := a.out.Write(data); err != nil {
				return err
			}
			continue
		}
		var c terminalControl
		if json.Unmarshal(data, &c) != nil {
			continue
		}
		switch c.Type {
		case "session_ready":
			if command != "" {
				if err := conn.Write(ctx, websocket.MessageBinary, []byte(command+"\rexit\r")); err != nil {
					return err
				}
			}
		case "exit":
			_ = conn.Close(websocket.StatusNormalClosure, "")
			if c.Code == nil {
				return &exitError{code: ExitError, err: fmt.Errorf("the terminal session ended: %s", c.Reason)}
			}
			return &exitError{code: *c.Code, quiet: true}
		case "error":
			var env api.ErrorResponse
			if json.Unmarshal(c.Error, &env) == nil {
				fmt.Fprintf(a.errOut, "\r\nterminal: %s (code %s, correlation id %s)\r\n", env.Message, env.Code, env.CorrelationID)
			}
		}
	}
}
